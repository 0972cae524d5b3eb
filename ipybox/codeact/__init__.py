"""Code as tool: what an agent builds on top of the generated `mcptools/` packages, next to them in the
workspace (see `layout`):

    mcptools/<server>/<tool>.py       generated from the server's tool schemas (`ipybox.mcp_apigen`)
    mcpparse/<server>/<tool>.py       an output parser an agent wrote: `ParseResult` and `parse(raw)`;
                                      the generated module then gains `ParseResult` and `run_parsed()`
    gentools/<category>/<name>/       a saved code action: `api.py` (its interface: `Params`, a result
                                      model, `run()` with a docstring), `impl.py` (its composition of
                                      `mcptools` and other `gentools`), `__init__.py` re-exporting the api

All three hold agent-written code. The host only ever *parses* it (`ast`): it is imported and run in
kernels only, as everything else an agent writes (`checks` builds the code a fresh kernel runs to check
it). `analysis` lists which tools a saved action may call, `index` ranks tools and actions for
`search_tools`, `actions` saves actions.
"""
