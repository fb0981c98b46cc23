from gptspec.cli import main

raise SystemExit(main())
