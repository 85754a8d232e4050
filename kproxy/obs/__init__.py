"""Observability: metrics (declared once), logging, trace schema and writer."""
