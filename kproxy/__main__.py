from kproxy.cli import main

main()
