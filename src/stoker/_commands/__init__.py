"""What every ``stoker`` command shares: its console, its output file checks, its target, and
untrusted text made printable."""
