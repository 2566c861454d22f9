"""Scenario II, ABNet: the encoder role on cluster S and the decoder role on cluster T,
bound by request/reply flows (``plan``); the job section (``job``), evaluation on T
(``evaluation``), offline translation (``translate``) and the compute benchmark (``bench``)."""
