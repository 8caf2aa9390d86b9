#!/usr/bin/env bash
# Generates throwaway certificates for tern's TLS tests into DIR (EC P-256, valid one day):
#   ca.pem/ca.key              test CA
#   server.pem/server.key      server cert for 127.0.0.1 / localhost, signed by the CA
#   client.pem/client.key      client cert with CN=sensor-7, signed by the CA
#   san-client.pem/.key        client cert without CN, SAN DNS:device-9.example, signed by the CA
#   rogue-ca.pem, rogue.pem/.key  a client cert signed by another CA (must be refused)
# Usage: scripts/gen-test-certs.sh DIR
set -euo pipefail
dir=${1:?usage: gen-test-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

ca() { # name subject
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 1 -subj "$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

leaf() { # name subject ca extensions
    key "$1.key"
    openssl req -new -key "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" "$4" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial \
        -out "$1.pem" -days 1 -extfile "$1.ext" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

ca ca "/CN=tern test CA"
leaf server "/CN=localhost" ca "extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
leaf client "/O=tern tests/CN=sensor-7" ca "extendedKeyUsage=clientAuth"
leaf san-client "/O=tern tests" ca "extendedKeyUsage=clientAuth
subjectAltName=DNS:device-9.example"
ca rogue-ca "/CN=rogue CA"
leaf rogue "/CN=sensor-7" rogue-ca "extendedKeyUsage=clientAuth"
