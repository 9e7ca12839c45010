from hasten.cli import main

raise SystemExit(main())
