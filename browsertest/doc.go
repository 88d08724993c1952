// Package browsertest drives the service's dashboard in headless Chromium
// (chromedp). It is a module of its own, so that the library's go.mod does
// not require a browser driver; it tests the module in the directory above
// (a replace directive), never a released version.
package browsertest
