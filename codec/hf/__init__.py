"""Hugging Face EnCodec, DAC and Mimi folders behind the codec interface (adapter.py; one module a family)."""
