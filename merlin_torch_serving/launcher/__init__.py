"""Launching and supervising a local tritonserver: ``server`` its public face, ``TritonServer``,
over parts of one concern each:

- ``preflight``: what can be found wrong before it starts (a taken port, a wrong folder);
- ``config``: the options, checked once, and the command line they make;
- ``locate``: which binary runs, with which backend folder and environment;
- ``child`` and ``process``: the child process, its process group, its log, what /proc says;
- ``running``: a started server as Triton sees it: ready, its models loaded and unloaded;
- ``admin``: the server's admin endpoints, through ``tritonclient.http``;
- ``access``: the address it listens on, and the key that guards its admin APIs;
- ``diagnostics``: pure functions over the server's log that find what went wrong and word it;
- ``stubs`` and ``supervision``: the python-backend stubs' health, and the thread that repairs it.
"""
