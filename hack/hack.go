// Package hack holds the repository's own checks, run by make lint; its
// test checks the checks.
package hack
