package io.bkaudit.interop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Enumeration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.BkauditPinnedPlacementPolicy;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerEntry;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.client.api.LedgerMetadata;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.net.BookieId;

/**
 * The Java side of the bkaudit interop tests: a BookKeeper 4.17 client driven by JSON lines.
 *
 * <p>Each line on stdin is one request object with a "cmd"; each reply is one JSON line on
 * stdout (logging goes to stderr/log4j). One process serves a whole test session, so the JVM and
 * client start-up is paid once. Clients are cached per metadataServiceUri; ledgers written
 * without "close" stay open in this process, as a writer that has not closed yet (or crashed,
 * once the process is killed).
 */
public final class Driver {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Base64.Encoder B64 = Base64.getEncoder();
    private static final Base64.Decoder UNB64 = Base64.getDecoder();

    private final Map<String, BookKeeper> clients = new HashMap<>();
    private final Map<Long, LedgerHandle> open = new HashMap<>();

    public static void main(String[] args) throws Exception {
        // Replies go to the real stdout; anything else that prints there would corrupt them.
        PrintStream out = new PrintStream(System.out, true, "UTF-8");
        System.setOut(System.err);
        Driver driver = new Driver();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        out.println("{\"ready\":true}");
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            ObjectNode reply;
            try {
                JsonNode req = JSON.readTree(line);
                if ("exit".equals(req.path("cmd").asText())) {
                    break;
                }
                if ("halt".equals(req.path("cmd").asText())) {
                    // A crash: no close, no session cleanup.
                    Runtime.getRuntime().halt(0);
                }
                reply = driver.handle(req);
            } catch (BKException e) {
                reply = error(e.getCode(), e.getClass().getSimpleName(), e.getMessage());
            } catch (Exception e) {
                Throwable cause = e;
                while (cause.getCause() != null && !(cause instanceof BKException)) {
                    cause = cause.getCause();
                }
                int code = cause instanceof BKException ? ((BKException) cause).getCode() : -999;
                reply = error(code, cause.getClass().getSimpleName(), String.valueOf(cause.getMessage()));
            }
            out.println(JSON.writeValueAsString(reply));
        }
        driver.shutdown();
        out.println("{\"bye\":true}");
    }

    private static ObjectNode error(int code, String name, String message) {
        ObjectNode o = JSON.createObjectNode();
        o.put("error", code);
        o.put("name", name);
        o.put("message", message);
        return o;
    }

    private BookKeeper client(JsonNode req) throws Exception {
        String uri = req.path("uri").asText();
        // Pulsar's brokers speak the v2 (binary) protocol to bookies: "v2" selects it.
        boolean v2 = req.path("v2").asBoolean(false);
        // Extra ClientConfiguration keys (e.g. TLS: tlsProviderFactoryClass, tlsTrustStore...):
        // one client per distinct set.
        JsonNode extra = req.path("conf");
        String key = uri + (v2 ? "#v2" : "#v3") + (extra.isObject() ? "#" + extra : "");
        BookKeeper bk = clients.get(key);
        if (bk == null) {
            ClientConfiguration conf = new ClientConfiguration();
            conf.setMetadataServiceUri(uri);
            conf.setZkTimeout(10000);
            conf.setAddEntryTimeout(10);
            conf.setReadEntryTimeout(10);
            // Lets reads open ledgers without being told their digest type (v3 metadata has it).
            conf.setEnableDigestTypeAutodetection(true);
            conf.setEnsemblePlacementPolicy(BkauditPinnedPlacementPolicy.class);
            conf.setUseV2WireProtocol(v2);
            extra.fields().forEachRemaining(f -> conf.setProperty(f.getKey(), f.getValue().asText()));
            bk = new BookKeeper(conf);
            clients.put(key, bk);
        }
        return bk;
    }

    private void shutdown() {
        for (BookKeeper bk : clients.values()) {
            try {
                bk.close();
            } catch (Exception e) {
                // shutting down anyway
            }
        }
    }

    static BookKeeper.DigestType digest(String name) {
        switch (name) {
            case "HMAC":
            case "MAC":
                return BookKeeper.DigestType.MAC;
            default:
                return BookKeeper.DigestType.valueOf(name);
        }
    }

    private static byte[] password(JsonNode req) {
        return UNB64.decode(req.path("password").asText(""));
    }

    private ObjectNode handle(JsonNode req) throws Exception {
        String cmd = req.path("cmd").asText();
        switch (cmd) {
            case "ping":
                return JSON.createObjectNode().put("pong", true);
            case "write":
                return write(req);
            case "add":
                return add(req);
            case "close":
                return close(req);
            case "read":
                return read(req);
            case "batchRead":
                return batchRead(req);
            case "metadata":
                return metadata(client(req), req.path("ledgerId").asLong());
            default:
                throw new IllegalArgumentException("unknown command " + cmd);
        }
    }

    /** Create a ledger, add the given payloads synchronously, optionally close it. */
    private ObjectNode write(JsonNode req) throws Exception {
        BookKeeper bk = client(req);
        List<BookieId> pin = null;
        if (req.has("bookies")) {
            pin = new ArrayList<>();
            for (JsonNode b : req.get("bookies")) {
                pin.add(BookieId.parse(b.asText()));
            }
        }
        Map<String, byte[]> custom = new HashMap<>();
        req.path("custom").fields().forEachRemaining(f -> custom.put(f.getKey(), UNB64.decode(f.getValue().asText())));
        LedgerHandle lh;
        BkauditPinnedPlacementPolicy.pin(pin);
        try {
            lh = bk.createLedger(req.path("ensemble").asInt(3), req.path("writeQuorum").asInt(2),
                    req.path("ackQuorum").asInt(2), digest(req.path("digest").asText("CRC32C")),
                    password(req), custom);
        } finally {
            BkauditPinnedPlacementPolicy.pin(null);
        }
        open.put(lh.getId(), lh);
        ObjectNode reply = req.path("pipelined").asBoolean(false)
                ? addPipelined(lh, req.path("payloads"))
                : addAll(lh, req.path("payloads"));
        if (req.path("close").asBoolean(true)) {
            lh.close();
            open.remove(lh.getId());
        }
        reply.put("ledgerId", lh.getId());
        return reply;
    }

    private ObjectNode addAll(LedgerHandle lh, JsonNode payloads) throws Exception {
        long last = -1;
        for (JsonNode p : payloads) {
            last = lh.addEntry(UNB64.decode(p.asText()));
        }
        ObjectNode reply = JSON.createObjectNode();
        reply.put("lastEntryId", last);
        reply.put("lastAddConfirmed", lh.getLastAddConfirmed());
        return reply;
    }

    /** All adds in flight at once (benchmark data); fails with the first error. */
    private ObjectNode addPipelined(LedgerHandle lh, JsonNode payloads) throws Exception {
        int n = payloads.size();
        CountDownLatch done = new CountDownLatch(n);
        AtomicInteger firstError = new AtomicInteger(BKException.Code.OK);
        for (JsonNode p : payloads) {
            lh.asyncAddEntry(UNB64.decode(p.asText()), (rc, handle, entryId, ctx) -> {
                if (rc != BKException.Code.OK) {
                    firstError.compareAndSet(BKException.Code.OK, rc);
                }
                done.countDown();
            }, null);
        }
        done.await();
        if (firstError.get() != BKException.Code.OK) {
            throw BKException.create(firstError.get());
        }
        ObjectNode reply = JSON.createObjectNode();
        reply.put("lastEntryId", n - 1);
        reply.put("lastAddConfirmed", lh.getLastAddConfirmed());
        return reply;
    }

    private LedgerHandle openHandle(JsonNode req) throws BKException {
        long id = req.path("ledgerId").asLong();
        LedgerHandle lh = open.get(id);
        if (lh == null) {
            throw new BKException.BKNoSuchLedgerExistsException();
        }
        return lh;
    }

    private ObjectNode add(JsonNode req) throws Exception {
        return addAll(openHandle(req), req.path("payloads"));
    }

    private ObjectNode close(JsonNode req) throws Exception {
        LedgerHandle lh = openHandle(req);
        lh.close();
        open.remove(lh.getId());
        return JSON.createObjectNode().put("closed", true);
    }

    /** Open (with recovery if asked) and read every entry up to lastEntryId, or the LAC. */
    private ObjectNode read(JsonNode req) throws Exception {
        BookKeeper bk = client(req);
        long id = req.path("ledgerId").asLong();
        BookKeeper.DigestType dt = digest(req.path("digest").asText("CRC32C"));
        LedgerHandle lh = req.path("recovery").asBoolean(false)
                ? bk.openLedger(id, dt, password(req))
                : bk.openLedgerNoRecovery(id, dt, password(req));
        try {
            long last = lh.isClosed() ? lh.getLastAddConfirmed() : lh.readLastConfirmed();
            ObjectNode reply = JSON.createObjectNode();
            reply.put("closed", lh.isClosed());
            reply.put("last", last);
            ArrayNode entries = reply.putArray("entries");
            long first = 0;
            while (first <= last) {
                long to = Math.min(last, first + 99);
                Enumeration<LedgerEntry> it = lh.readEntries(first, to);
                while (it.hasMoreElements()) {
                    LedgerEntry e = it.nextElement();
                    if (e.getEntryId() != first) {
                        throw new IllegalStateException("entry " + e.getEntryId() + " where " + first + " was expected");
                    }
                    entries.add(B64.encodeToString(e.getEntry()));
                    first++;
                }
            }
            reply.set("metadata", describe(lh.getLedgerMetadata()));
            return reply;
        } finally {
            // Closing a read handle never writes metadata; it only releases client state.
            lh.close();
        }
    }

    /**
     * One LedgerHandle.batchReadEntries call (BATCH_READ_ENTRY; needs the v2 client and
     * ensemble == write quorum, else BookKeeper silently falls back to single reads).
     */
    private ObjectNode batchRead(JsonNode req) throws Exception {
        BookKeeper bk = client(req);
        LedgerHandle lh = bk.openLedgerNoRecovery(req.path("ledgerId").asLong(),
                digest(req.path("digest").asText("CRC32C")), password(req));
        try {
            ObjectNode reply = JSON.createObjectNode();
            ArrayNode entries = reply.putArray("entries");
            ArrayNode ids = reply.putArray("entryIds");
            // Reflection: batchReadEntries is 4.17+, and the driver also compiles against 4.16.
            @SuppressWarnings("unchecked")
            Enumeration<LedgerEntry> it = (Enumeration<LedgerEntry>) LedgerHandle.class
                    .getMethod("batchReadEntries", long.class, int.class, long.class)
                    .invoke(lh, req.path("start").asLong(), req.path("maxCount").asInt(),
                            req.path("maxSize").asLong());
            while (it.hasMoreElements()) {
                LedgerEntry e = it.nextElement();
                ids.add(e.getEntryId());
                entries.add(B64.encodeToString(e.getEntry()));
            }
            return reply;
        } finally {
            lh.close();
        }
    }

    private ObjectNode metadata(BookKeeper bk, long id) throws Exception {
        return describe(bk.getLedgerManager().readLedgerMetadata(id).get().getValue());
    }

    static ObjectNode describe(LedgerMetadata md) {
        ObjectNode o = JSON.createObjectNode();
        o.put("ledgerId", md.getLedgerId());
        o.put("formatVersion", md.getMetadataFormatVersion());
        o.put("ensembleSize", md.getEnsembleSize());
        o.put("writeQuorum", md.getWriteQuorumSize());
        o.put("ackQuorum", md.getAckQuorumSize());
        o.put("state", md.getState().name());
        o.put("lastEntryId", md.getLastEntryId());
        o.put("length", md.getLength());
        // Format v1 metadata stores no digest type (nor password).
        o.put("digestType", md.getDigestType() == null ? null : md.getDigestType().name());
        o.put("password", md.hasPassword() ? B64.encodeToString(md.getPassword()) : null);
        o.put("ctime", md.getCtime());
        o.put("cToken", md.getCToken());
        ObjectNode ens = o.putObject("ensembles");
        md.getAllEnsembles().forEach((k, v) -> {
            ArrayNode a = ens.putArray(Long.toString(k));
            v.forEach(b -> a.add(b.toString()));
        });
        ObjectNode custom = o.putObject("custom");
        md.getCustomMetadata().forEach((k, v) -> custom.put(k, B64.encodeToString(v)));
        o.put("text", md.toString());
        return o;
    }
}
