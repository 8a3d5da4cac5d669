"""The retrieval service as a Ray Serve application: replicas of the same app, engine and batcher behind Serve's one
HTTP address, and a sharded mode (a router fans each batch out to shards of a flat index and merges exact top-k).

``options.ServeOptions`` declares the fleet settings; ``deployments`` holds the Serve classes; ``shards`` the fan-out;
``cli`` the command (``python -m local_dense_retriever.serve``). Modules here may import ray, the rest of the service
and ``verl_search.protocol`` / ``verl_search.atomic``; nothing else of ours. Importing this package imports no Ray.
"""
