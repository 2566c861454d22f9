"""Scenario II studies: BLEU evaluation, Table 5 / Figure 10 compression study, auto codec choice."""
