"""A recording OpenAI proxy: `infersight proxy --upstream URL --store S`.

It sits in front of any OpenAI-compatible server (vLLM, SGLang, infersight itself), forwards
every request, asks the upstream for what the store needs (token IDs, a chat's rendered prompt)
without changing what the client receives, times each token as the stream passes, and writes
one `requests` row per answered request through infersight's Recorder. See README.md, "The CLI".
"""
