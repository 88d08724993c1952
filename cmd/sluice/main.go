// Command sluice runs the sluice rate-limit service:
//
//	sluice serve [--config FILE] [--redis URL] [--http ADDR] [--grpc ADDR]
//	sluice check-config FILE
//	sluice version
//
// Everything lives in package sluice/server; this is only the entry point.
package main

import (
	"os"

	"github.com/sluicehq/sluice/server"
)

func main() {
	os.Exit(server.Main(os.Args[1:], os.Stdout, os.Stderr))
}
