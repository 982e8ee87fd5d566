"""``python -m mnn_h2o.serve``: an OpenAI-compatible local server over one loaded model, many
conversations under one KV memory budget, and a chat page (docs/serve.md).

    validation.py    request bodies in: checked into plain requests, or an OpenAI-style error
    responses.py     response bodies out: completions, stream chunks, usage, errors
    pool.py          the conversations: prefix match by key, LRU, offload to the store, every turn written
    session_store.py where they wait: memory, disk or a Redis that several servers share
    model_thread.py  the one thread that runs the model, streaming to the event loop
    app.py           the FastAPI routes
    page.html        the chat page served at /
    __main__.py      the command line
    replicas.py      python -m mnn_h2o.serve.replicas: servers behind nginx on one Redis, on loopback

The runtime (the top-level mnn_h2o modules) never imports this package; it needs the ``serve``
extra (``pip install 'mnn_h2o[serve]'``).
"""
