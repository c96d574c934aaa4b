"""Controlled experiments that run the whole pipeline on generated sessions with a checkable answer."""
