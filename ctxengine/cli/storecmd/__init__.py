"""``ctx`` verbs that maintain the snapshot store: gc, export, import, store stats.

They need no model. Shared options and helpers come from cli/contexts.
"""
