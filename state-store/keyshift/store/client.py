"""Open a state store from a URL.

``redis://host:port[/db]`` and ``rediss://`` (TLS) name a standalone
Valkey/Redis server; ``redis+cluster://host:port[,host:port...]`` and
``rediss+cluster://`` name a Redis Cluster by one or more seed nodes.

Credentials never travel in the URL: a URL with a password is refused.  Pass
``password`` (and ``username``), which the worker and operator read from a
mounted Secret file or the environment.

With TLS the server's certificate is verified (chain and host name) against the
system's CAs, or against ``ca_file`` (a PEM file) / ``ca_data`` (PEM text) when
given: the CA of a store with its own CA, as the chart's managed Valkey has (the
``ca.crt`` key of the store's Secret).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff

from keyshift.errors import KeyshiftError
from keyshift.store.connection import HiredisConnection, HiredisSSLConnection
from keyshift.store.redis_backend import RedisStateStore

SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")


class InvalidStoreURL(KeyshiftError, ValueError):
    pass


def parse_store_url(url: str) -> tuple[str, list[tuple[str, int]], int]:
    """Return ``(scheme, [(host, port), ...], db)``; raise :class:`InvalidStoreURL`."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise InvalidStoreURL(
            f"state store URL {url!r}: scheme must be one of {', '.join(SCHEMES)}"
        )
    if parts.password is not None or (parts.username and "@" in parts.netloc):
        raise InvalidStoreURL(
            "state store URL must not carry credentials; give them through a Secret "
            "(stateStore.secretRef) or KEYSHIFT_STORE_PASSWORD"
        )
    nodes: list[tuple[str, int]] = []
    for hostport in parts.netloc.split(","):
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "6379")
        if not host:
            raise InvalidStoreURL(f"state store URL {url!r}: missing host")
        try:
            nodes.append((host, int(port)))
        except ValueError:
            raise InvalidStoreURL(f"state store URL {url!r}: bad port {port!r}") from None
    db = 0
    path = parts.path.strip("/")
    if path:
        if parts.scheme.endswith("+cluster"):
            raise InvalidStoreURL("a Redis Cluster has no database number; drop the path")
        try:
            db = int(path)
        except ValueError:
            raise InvalidStoreURL(f"state store URL {url!r}: bad database {path!r}") from None
    if len(nodes) > 1 and not parts.scheme.endswith("+cluster"):
        raise InvalidStoreURL("several hosts are only allowed with redis+cluster://")
    return parts.scheme, nodes, db


def open_store(
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    socket_timeout: float = 5.0,
    retry_seconds: float = 30.0,
    ca_file: str | None = None,
    ca_data: str | None = None,
) -> RedisStateStore:
    """A :class:`~keyshift.store.redis_backend.RedisStateStore` for ``url`` (connects lazily).

    ``ca_file``/``ca_data``: the CA (PEM) that signed a TLS store's certificate; ignored
    for a ``redis://`` URL.
    """
    scheme, nodes, db = parse_store_url(url)
    tls = scheme.startswith("rediss")
    connection_class = HiredisSSLConnection if tls else HiredisConnection
    tls_kwargs: dict[str, Any] = {}
    if tls and ca_file:
        tls_kwargs["ssl_ca_certs"] = ca_file
    if tls and ca_data:
        tls_kwargs["ssl_ca_data"] = ca_data
    if scheme.endswith("+cluster"):
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p, connection_class=connection_class) for h, p in nodes],
            username=username,
            password=password,
            ssl=tls,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            # the cluster client follows MOVED and failovers itself; the store's
            # own retry loop covers outages beyond that
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3),
            **tls_kwargs,
        )
        # nodes found later are built from these keyword arguments
        # (the CA included: RedisCluster puts the ssl_* arguments there)
        cluster.nodes_manager.connection_kwargs["connection_class"] = connection_class
        return RedisStateStore(cluster, cluster=True, retry_seconds=retry_seconds, url=url)
    host, port = nodes[0]
    pool = aioredis.ConnectionPool(
        connection_class=connection_class,
        host=host,
        port=port,
        db=db,
        username=username,
        password=password,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        **tls_kwargs,
    )
    client = aioredis.Redis(connection_pool=pool)
    return RedisStateStore(client, cluster=False, retry_seconds=retry_seconds, url=url)
