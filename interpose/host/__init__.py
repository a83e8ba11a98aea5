"""The host side's time (docs/host-time.md): the virtual clock that time.* reads (clock.py), the
measured CPU time of the program's own Python (host_time.py), Python-level events that cost host
time (python_events.py), and DataLoader workers' time (data_loading.py)."""
