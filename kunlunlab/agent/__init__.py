"""The search-think agent: protocol (prompts and parsing); rollout engine and mechanisms to come."""
from kunlunlab.agent.protocol import Turn, build_messages, extract_boxed, format_results, parse_turn

__all__ = ["Turn", "build_messages", "extract_boxed", "format_results", "parse_turn"]
