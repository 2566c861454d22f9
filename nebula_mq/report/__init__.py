"""``nebula-mq report RUN_DIR``: one offline HTML page about a job's run directory.

``parse`` reads the files, ``derive`` computes rates and ratios, ``plots``
draws PNGs (matplotlib Agg) and ``render`` assembles the page; ``feed`` adds every worker of
every cluster from the job's status feed (``report --serve --feed CLUSTER``).
"""
