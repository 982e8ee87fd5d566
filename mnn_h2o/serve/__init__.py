"""``python -m mnn_h2o.serve``: an OpenAI-compatible local server over one loaded model, many
conversations under one KV memory budget, and a chat page (docs/serve.md).

    validation.py    request bodies in: checked into plain requests, or an OpenAI-style error
    responses.py     response bodies out: completions, stream chunks, usage, errors
    pool.py          the conversations: prefix match, LRU, offload to disk and restore
    model_thread.py  the one thread that runs the model, streaming to the event loop
    app.py           the FastAPI routes
    page.html        the chat page served at /
    __main__.py      the command line

The runtime (the top-level mnn_h2o modules) never imports this package; it needs the ``serve``
extra (``pip install 'mnn_h2o[serve]'``).
"""
