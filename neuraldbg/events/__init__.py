"""Semantic events: the record, detectors, collapsing and compression."""
