from rltrain.cli.train import main

main()
