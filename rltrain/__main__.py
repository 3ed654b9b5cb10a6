from rltrain.cli import main

main()
