"""pyinfra's operation order, read from the call stack without reading any source file.

In CLI mode pyinfra orders each operation by the line numbers of the call stack from the deploy file
down (pyinfra/api/util.py get_operation_order_from_stack, called for every operation on every host by
pyinfra/api/operation.py solve_operation_consistency). pyinfra 3.10.0 takes them from
inspect.stack(), which, for every frame, finds the frame's source file, scans sys.modules for its
module and reads the lines around the call (context=1), and then from inspect.getframeinfo() once
more per frame, which does it all again. Only each frame's file name and line number are used.

On the lab's pair a no-op deploy calls it about 160 times (one per operation and host); profiled,
those calls took the largest share of the controller's own CPU in prepare (inspect's getmodule and
findsource: 3485 calls). The replacement below walks the same frames (sys._getframe) and reads the
same two values from each (the code's file name, the frame's line number), which are what
inspect.getframeinfo returns for a frame whose file exists; the list it returns is the same, so
every operation's order and hash is the same (tests/unit/test_op_order.py holds it to pyinfra's own
function, on this pinned pyinfra).
"""
import sys

PYINFRA_VERSION = "3.10.0"  # the release whose function this one is proven equal to (pyproject.toml pins it)


def operation_order(state) -> list[int]:
    """pyinfra.api.util.get_operation_order_from_stack(state), frame by frame, without inspect."""
    import pyinfra
    from pyinfra.api.util import PYINFRA_INSTALL_DIR

    # Innermost last, as reversed(inspect.stack()) lists them; None stands for the frame of pyinfra's
    # own function, the innermost of its stack(), which never matches and is always skipped.
    frames = [None]
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()

    i = 0
    # The *first* occurrence of the deploy file (pyinfra's loop as it is: without one, i ends on the
    # innermost frame)
    if state.current_deploy_filename:
        for i, frame in enumerate(frames):
            if frame is not None and frame.f_code.co_filename == state.current_deploy_filename:
                break

    line_numbers = []
    if pyinfra.is_cli:
        line_numbers.append(state.current_op_file_number)
    for frame in frames[i:]:
        if frame is None or frame.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR):
            continue
        line_numbers.append(frame.f_lineno)
    return line_numbers


def install() -> None:
    """Put operation_order in the place pyinfra's operation module calls it from; on another pyinfra
    release than PYINFRA_VERSION, leave pyinfra's own (correct, slower) in place."""
    from importlib import import_module
    from importlib.metadata import version

    # The module: pyinfra.api's own `operation` name is the decorator, which `import ... as` would bind.
    operation = import_module("pyinfra.api.operation")
    if version("pyinfra") == PYINFRA_VERSION:
        operation.get_operation_order_from_stack = operation_order
