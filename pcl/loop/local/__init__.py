"""A run in one process on one device (`pcl train CONFIG --local`): the same step loop and schedule (`pcl.loop`) on
in-process ports over the core classes the actors wrap.

    layout.py   the config's layout mapped onto one process and one device, or refused naming the setting
    ports.py    the loop's ports in this process: V, the engine and reward pool, the learner and its weight copy
    parts.py    building those parts (a process group of one for the FSDP2 learner) and closing them

The driver around it (run directory, trackers, the control plane, printing) is `entrypoints/local.py`.
"""
