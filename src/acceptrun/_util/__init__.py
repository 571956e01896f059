"""Helpers every layer may use: durable writes, hashing."""
