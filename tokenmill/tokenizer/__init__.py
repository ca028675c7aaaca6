"""Tokenization: GGUF / Hugging Face tokenizers, chat templates and incremental detokenization."""

from __future__ import annotations

from tokenmill.tokenizer.chat_template import ChatTemplateError, ChatTemplateSecurityError, render_chat_template
from tokenmill.tokenizer.detokenizer import IncrementalDetokenizer
from tokenmill.tokenizer.tokenizer import Tokenizer

__all__ = ["ChatTemplateError", "ChatTemplateSecurityError", "IncrementalDetokenizer", "Tokenizer",
           "render_chat_template"]
