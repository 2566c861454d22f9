"""Offline corpora for the two scenarios, built from what Debian ships.

* :mod:`.catalogues` reads and cleans gettext ``.mo`` catalogues;
* :mod:`.bible` aligns Reina-Valera 1909 with the World English Bible (SWORD modules);
* :mod:`.parallel` builds the es→en corpus, split by source so nothing leaks;
* :mod:`.multilingual` builds per-language-family text for pre-training;
* :mod:`.batches` turns a split into padded id arrays (:mod:`.translation` batches them);
* :mod:`.build` runs all of it into one data directory, described by a manifest.

Nothing here imports paddle: arrays are numpy, files are JSON lines.
"""
