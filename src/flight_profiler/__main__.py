from __future__ import annotations

from flight_profiler.cli.main import main

if __name__ == "__main__":
    main()
