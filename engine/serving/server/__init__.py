"""The OpenAI-compatible HTTP server of one replica (`infersight serve`)."""
