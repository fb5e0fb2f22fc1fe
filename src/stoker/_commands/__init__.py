"""What every ``stoker`` command shares: its console, its output file checks, its target."""
