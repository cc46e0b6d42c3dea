"""The command-line tools: one module per script of ``tools/`` and ``demo/`` (its
``parse_args(argv)`` and ``main(argv)``). What they all share (config loading, codebase
detection, the shared options and the failure messages) is
:mod:`mmplugin_inline.tools_common`.

A script under ``tools/`` only calls its module's ``main``; the work itself is in
``mmplugin_inline.analysis``, ``mmplugin_inline.deployment`` and the rest of the
package, so tests and other code import it instead of loading a script by path.
"""
