from delayq.cli.main import main

main()
