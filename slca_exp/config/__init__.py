"""Typed config schema, composition and validation."""
