"""Generation: the library API, chat, sessions, batching, logprobs, tools and reasoning."""
