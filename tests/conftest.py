import os

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():  # the Triton kernels' tests run under its interpreter, set before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "default", deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


BOOK_FIXTURES = {"browser", "built_book"}  # the book's build and its pages: minutes, not seconds


def pytest_collection_modifyitems(config, items):
    """Executing a chapter, building the book and opening its pages are ``slow``; GPU tests run only when
    asked (``-m gpu``) and a CUDA device exists."""
    for item in items:
        if getattr(item, "originalname", "") == "test_chapter_executes" or BOOK_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
