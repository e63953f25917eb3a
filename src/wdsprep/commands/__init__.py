"""The core's commands, one module per verb, each one `wdsprep.command.Command` named `COMMAND`:

    convert.py   convert SOURCE INPUT OUTPUT    native data -> shards + manifest.json
    synth.py     synth SOURCE DIR               synthetic native data
    inspect.py   inspect DIR_OR_URL             splits, counts, sizes, sample fields
    verify.py    verify DIR_OR_URL              sha256, counts, every member decodes
    show.py      show DIR_OR_URL                samples drawn as pictures, one HTML file (the plugin gate)
    pipeline.py  pipeline pipelines/X.toml      a spec's input made (synth, or synth -> serve -> fetch), converted
    upload.py    upload SHARD_DIR URL           copy shards to a store; verified, manifest last
    reindex.py   reindex DIR_OR_URL             give older shards their sample index
    index.py     index SHARDS... --out OUT      adopt existing WebDataset tars where they are (wdsprep.adopt)
    serve.py     serve dataverse DIR            a local Dataverse-compatible server (wdsprep.testing)

The commands sources mount (`Source.commands()`: rawnind's `fetch rawnind`) are theirs, in the
source's package. `wdsprep.cli` holds the table of all of them, the dispatcher and the one error
convention; a command here only parses its arguments, calls the module that does the work (the
driver, `upload`, `reindex`, `adopt`, `show.report`, `stream.verify`, ...) and prints what it did; its
errors are raised, never printed.
"""
