"""Anthropic's Messages API (/v1/messages), answered by the chat path."""
