"""Scenario I, ELECTRA: generator processes on A (or one cluster each, M3), the root and
sub-discriminators on B (``plan``); the job section (``common``, ``job``), data streams
(``data``), flows and identities (``flows``) and the cross-lingual probe (``probe``)."""
