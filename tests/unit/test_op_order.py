"""sparkfleet/op_order.py: the operation order pyinfra's own function gives, from the same stack."""
from importlib.metadata import version
from types import SimpleNamespace

from importlib import import_module

import pyinfra
import pytest
from pyinfra.api.util import get_operation_order_from_stack

from sparkfleet import op_order
from sparkfleet.op_order import operation_order

operation = import_module("pyinfra.api.operation")  # the module (pyinfra.api.operation is the decorator)


def both(state, depth: int):
    """Both functions' answers from one line of the same frame, `depth` frames of this file down."""
    if depth:
        return both(state, depth - 1)
    return get_operation_order_from_stack(state), operation_order(state)  # one line: one f_lineno


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_file", [__file__, "/nowhere/deploy.py", None])
@pytest.mark.parametrize("depth", [0, 3])
def test_the_order_is_pyinfras_own(monkeypatch, is_cli, deploy_file, depth):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=7)
    theirs, ours = both(state, depth)
    assert ours == theirs
    if is_cli and deploy_file == __file__:  # could fail: the frames of this file, each counted
        assert len(ours) >= depth + 2


def test_install_replaces_pyinfras_function_only_on_the_release_it_was_proven_on(monkeypatch):
    assert version("pyinfra") == op_order.PYINFRA_VERSION, "a new pyinfra: prove operation_order against it"
    monkeypatch.setattr(operation, "get_operation_order_from_stack", get_operation_order_from_stack)
    op_order.install()
    assert operation.get_operation_order_from_stack is operation_order
    monkeypatch.setattr(operation, "get_operation_order_from_stack", get_operation_order_from_stack)
    monkeypatch.setattr(op_order, "PYINFRA_VERSION", "0.0.0")
    op_order.install()
    assert operation.get_operation_order_from_stack is get_operation_order_from_stack
