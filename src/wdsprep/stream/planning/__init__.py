"""The planning wing of the read side: which samples a pass reads, before anything is read.

plan.py (dealing to ranks and workers, equalize, elastic resume, passes), catalog.py (a split as the
planner sees it, narrowed by a selection), select.py (select= expressions), samples.py (a split's
sample table as a selection reads it), state.py (the resume state and its checks). Planning imports
no surface of stream/ (dataset, mix, mapdataset, loader, slabs, worker) and, of the reading wing,
only the one index loader (samples.py: the keys of shards converted before sample tables existed).
"""
