"""``python -m kunlunlab.bench``: see :mod:`kunlunlab.bench`."""
from kunlunlab.bench import main

raise SystemExit(main())
