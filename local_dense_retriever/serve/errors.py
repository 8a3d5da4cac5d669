"""Why a Serve deployment of the retriever cannot start, as typed errors (the CLI prints their one-line message); the
branch of the service's tree (``local_dense_retriever/errors.py``) that lives beside the Serve code.

RetrieverError
└── ServeSetupError
    ├── ServeExtraMissing    ray[serve] is not installed
    ├── RayUnreachable       no Ray cluster answers at the given address
    ├── ShardingError        the index cannot be split as asked (not flat, more shards than passages)
    └── DeploymentFailed     Serve could not bring the application up (replica constructor failed, time ran out)
"""

from __future__ import annotations

from local_dense_retriever.errors import RetrieverError


class ServeSetupError(RetrieverError, RuntimeError):
    """The retrieval fleet could not be started; the message says what to change."""


class ServeExtraMissing(ServeSetupError):
    pass


class RayUnreachable(ServeSetupError):
    pass


class ShardingError(ServeSetupError, ValueError):
    pass


class DeploymentFailed(ServeSetupError):
    pass
