"""The URL settings of a run config, checked by scheme before anything connects: `redis.url` (REDIS_URL) and
`logging.mlflow_tracking_uri` (MLFLOW_TRACKING_URI).

    check_redis_url("redis://:pw@host:6379/0")        # the URL, or ValueError saying what is wrong and the forms
    check_mlflow_uri("localhost:5000")                # ValueError: 'localhost' is no scheme MLflow stores runs in

A message never holds the URL itself (its password would go with it): `pcl.config` prints it masked beside the
key (`pcl.credentials.mask_url`).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from urllib.parse import parse_qsl, urlsplit

REDIS_FORMS = ("redis://[user:password@]host[:port][/db], rediss://... (TLS) or unix:///path/to/redis.sock[?db=N] "
               "(redis-py's URL forms)")

# The tracking stores MLflow builds itself (mlflow.tracking._tracking_service.utils): a local directory (a path, no
# scheme; `databricks` and `databricks-uc` alone read as such and are MLflow's too), file:, http(s)://, a
# Databricks profile (databricks://profile), Unity Catalog (databricks-uc, uc:), and the SQLAlchemy databases,
# each with an optional +driver (postgresql+psycopg2://). A plugin's schemes (entry point group
# mlflow.tracking_store) are taken as well.
MLFLOW_SCHEMES = ("file", "http", "https", "databricks", "databricks-uc", "uc")
MLFLOW_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
MLFLOW_FORMS = ("a local directory, file:///path, http(s)://host[:port], sqlite:///path.db, "
                "postgresql|mysql|mssql[+driver]://user:password@host[:port]/db, databricks[://profile], "
                "databricks-uc or uc:URL")


def _port(parts) -> None:
    try:
        parts.port
    except ValueError:  # not a number, or outside 0-65535
        raise ValueError("its port is not a number from 0 to 65535") from None


def check_redis_url(url: str) -> str:
    """`url` when redis-py can connect by it (the scheme, a host or socket path, the port, the database number);
    else ValueError naming the fault and the allowed forms."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        found = f"the scheme {parts.scheme!r} is not Redis's" if parts.scheme else "it has no scheme"
        raise ValueError(f"{found}; a Redis URL is {REDIS_FORMS}")
    try:
        _port(parts)
        if parts.scheme == "unix":
            if parts.hostname or not parts.path:
                raise ValueError("a unix:// URL names the server's socket by its absolute path (unix:///path, no "
                                 "host)")
            db = dict(parse_qsl(parts.query)).get("db", "0")
        else:
            if not parts.hostname:
                raise ValueError("it names no host")
            db = parts.path.strip("/") or "0"
        if not db.isdigit():
            raise ValueError(f"its database {db!r} is not a number")
    except ValueError as exc:
        raise ValueError(f"{exc}; a Redis URL is {REDIS_FORMS}") from None
    return url


def check_mlflow_uri(uri: str) -> str:
    """`uri` when it is a local directory or names a tracking store MLflow has (MLFLOW_SCHEMES, MLFLOW_DATABASES,
    a plugin's scheme) with a host where the store needs one; else ValueError naming the fault and the forms."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if not scheme:
        if not uri.strip():
            raise ValueError(f"it is blank; an MLflow tracking URI is {MLFLOW_FORMS}")
        return uri  # a local directory
    known = scheme in MLFLOW_SCHEMES or scheme.split("+")[0] in MLFLOW_DATABASES
    if not known and scheme not in {ep.name for ep in entry_points(group="mlflow.tracking_store")}:
        raise ValueError(f"the scheme {parts.scheme!r} is no tracking store of MLflow's; an MLflow tracking URI is "
                         f"{MLFLOW_FORMS}")
    try:
        _port(parts)
        if scheme in ("http", "https") and not parts.hostname:
            raise ValueError("it names no host")
    except ValueError as exc:
        raise ValueError(f"{exc}; an MLflow tracking URI is {MLFLOW_FORMS}") from None
    return uri
