from pdserve.cli.main import main

main()
