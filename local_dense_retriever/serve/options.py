"""ServeOptions: every setting of the Serve fleet (placement, scaling, sharding), declared once; the server's own
settings stay in ``ServerConfig`` (its ``host``/``port`` become the Serve proxy's address)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ServeOptions(BaseModel):
    """How many retriever replicas run where, and how the index is split. Unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        default=None,
        description="Ray cluster to deploy into ('auto' = the cluster this node belongs to, or ray://HOST:PORT); "
        "None starts a local Ray instance that lives as long as this command.",
    )
    app_name: str = Field(default="retriever", min_length=1, description="Serve application name.")
    num_replicas: int = Field(default=1, ge=1, description="Replicas of the retriever (fixed; see min/max_replicas).")
    min_replicas: int | None = Field(default=None, ge=0, description="Autoscaling lower bound (with max_replicas).")
    max_replicas: int | None = Field(default=None, ge=1, description="Autoscaling upper bound (with min_replicas).")
    target_ongoing_requests: float = Field(
        default=64.0, gt=0, description="Autoscaling: requests in flight per replica that Serve aims for."
    )
    max_ongoing_requests: int = Field(
        default=1024,
        ge=1,
        description="Requests one replica accepts at once; its batcher coalesces them (Serve's default, 5, would "
        "starve batching). Beyond this the proxy queues.",
    )
    replicas_per_node: int | None = Field(default=None, ge=1, description="Most replicas on one node (None: any).")
    num_cpus: float = Field(default=1.0, ge=0, description="CPUs reserved per replica (a fraction is allowed).")
    num_gpus: float = Field(
        default=0.0,
        ge=0,
        description="GPUs per replica: 0 leaves the training GPUs alone; a fraction (e.g. 0.1) shares one with "
        "training.",
    )
    gateway_replicas: int = Field(
        default=0,
        ge=0,
        description="Gateways in front of the replicas: a request whose replica dies mid-flight is retried once on "
        "another (zero lost requests), at one more Serve hop per request (they reserve no CPU; see the README for "
        "its cost). 0: the replicas take HTTP themselves, and a request caught by a dying replica gets Serve's 500. "
        "/health and /metrics cover every replica either way.",
    )
    shards: int = Field(
        default=1, ge=1, description="Split the flat index into this many contiguous shards (1 = no sharding)."
    )
    shard_replicas: int = Field(default=1, ge=1, description="Replicas of each shard (sharded mode).")
    startup_timeout_s: float = Field(default=3600.0, gt=0, description="Longest wait for every replica to be ready.")
    detach: bool = Field(
        default=False,
        description="Deploy and exit, leaving the fleet in the cluster (needs an address); otherwise stay in the "
        "foreground and remove the application on SIGTERM/Ctrl-C.",
    )

    @model_validator(mode="after")
    def _check(self) -> ServeOptions:
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("give both --min_replicas and --max_replicas (autoscaling bounds), or neither")
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas={self.min_replicas} exceeds max_replicas={self.max_replicas}")
        if self.detach and self.address is None:
            raise ValueError("--detach needs --address: a local Ray instance ends with this command")
        return self

    def scaling(self) -> dict:
        """The replica-count part of a Serve deployment's options."""
        if self.max_replicas is None:
            return {"num_replicas": self.num_replicas}
        return {
            "autoscaling_config": {
                "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas,
                "initial_replicas": max(self.min_replicas, 1),
                "target_ongoing_requests": self.target_ongoing_requests,
            }
        }

    def actor_options(self) -> dict:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
