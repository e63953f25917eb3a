"""The reading wing of the read side: bytes of shards turned into checked samples.

read.py (samples [start, stop) of one shard, each checked against the shard's index; the one index
loader and the one member check), readahead.py (remote pieces fetched ahead by parallel Range
requests within a byte budget: the one Range engine), cache.py (the optional local shard cache),
access.py (random access: any sample by number, the one checked random read that MapDataset, show
and inspect use). Reading imports neither the planning wing nor the surfaces of stream/; what it
needs of the world (which DataLoader worker it runs in) is stream/world.py.
"""
