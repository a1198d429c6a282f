"""Every error class of the libraries reaches the API as a 4xx with the one error shape.

The classes are found by walking the public modules of ``analyzers`` (and the spec contract), so
a new error class that nobody mapped fails here instead of answering 500 in production.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

import analyzers
import contracts.spec
from service.core.config import Settings
from service.main import create_app


def _library_errors() -> Iterator[type[Exception]]:
    modules = [analyzers, contracts.spec]
    for info in pkgutil.walk_packages(analyzers.__path__, "analyzers."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            modules.append(importlib.import_module(info.name))
    seen: set[type[Exception]] = set()
    for module in modules:
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Exception)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and obj not in seen
            ):
                seen.add(obj)
                yield obj


ERRORS = sorted(_library_errors(), key=lambda cls: f"{cls.__module__}.{cls.__name__}")


def test_the_walk_finds_the_known_classes() -> None:
    names = {cls.__name__ for cls in ERRORS}
    assert {"TraceError", "BundleManifestError", "ManifestError", "CompareError"} <= names
    assert {"CatalogError", "SpecError", "TraceTooLargeError", "OversizedBundleError"} <= names


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("errors"), ingest_workers=0))
    by_name = {f"{cls.__module__}.{cls.__name__}": cls for cls in ERRORS}

    @app.get("/test-raise/{name}")
    def raise_it(name: str) -> None:
        raise by_name[name](f"{name}: the message names the field")

    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_every_library_error_is_a_4xx_with_the_error_shape(
    client: TestClient, cls: type[Exception]
) -> None:
    name = f"{cls.__module__}.{cls.__name__}"
    resp = client.get(f"/test-raise/{name}")
    assert 400 <= resp.status_code < 500, (name, resp.status_code, resp.text)
    body = resp.json()
    message = f"{name}: the message names the field"
    assert body == {"ok": False, "error": message, "errors": [message], "status": resp.status_code}
