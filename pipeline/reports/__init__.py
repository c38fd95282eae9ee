"""Wording and formats: report tables (Markdown and HTML from one description), verify's messages and
report files, reading recorded verdicts. Imports ``core``, ``runtime`` and ``precision``."""
