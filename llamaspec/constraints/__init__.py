"""What a text may say: JSON schemas, any JSON object, GBNF grammars and tool calls, checked and
compiled (``matcher``; a schema becomes a grammar in ``json_schema``), then followed token by
token (``Constraint``)."""

from .matcher import Constraint, Grammar, GrammarVocabulary, constraint_of

__all__ = ["Constraint", "Grammar", "GrammarVocabulary", "constraint_of"]
