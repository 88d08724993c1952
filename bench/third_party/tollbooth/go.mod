module github.com/didip/tollbooth/v8

go 1.19

require github.com/go-pkgz/expirable-cache/v3 v3.0.0
