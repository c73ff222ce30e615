module kvxfer.dev/kvxfer

go 1.19
