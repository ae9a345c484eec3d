"""The engine as running processes: one replica's OpenAI server, the recording proxy, a local fleet, the vLLM adapter."""
