/* The stock_locks admin dashboard: refreshes its tables from the JSON view
   (admin:stock_locks_dashboard_json) every few seconds, without a reload.

   The page is complete without this script: the template
   (templates/admin/stock_locks/dashboard.html) renders every table on the
   server. This builds the same rows, cells, classes and links from the JSON
   snapshot, formatted as the template's filters do
   (templatetags/stock_locks_dashboard.py): change them together.

   Loaded from a file (defer), nothing inline, so a strict
   Content-Security-Policy (script-src 'self') runs it. Text goes into the
   page as text nodes, never as HTML. */
(function () {
  "use strict";

  const root = document.getElementById("content-main");
  if (!root || !root.dataset.jsonUrl) return;
  const period = Number(root.dataset.refreshMs) || 3000; // milliseconds
  const actionUrl = root.dataset.actionUrl; // absent without the force permission
  const actionColumn = actionUrl ? 1 : 0;
  const search = (new URLSearchParams(window.location.search).get("q") || "").trim();
  const WINDOWS = { 300: "5m", 900: "15m", 3600: "1h" }; // seconds -> ?window= (views.WINDOWS)
  let refreshes = 0; // successful ones; the browser test waits on data-refreshes

  // -- formats, as the template's filters ----------------------------------------
  const MISSING = "-";
  const utc = (iso) => new Date(iso).toISOString(); // 2025-01-31T12:34:56.789Z
  const when = (iso) => (iso ? utc(iso).slice(0, 19).replace("T", " ") : MISSING);
  const clock = (iso) => (iso ? utc(iso).slice(11, 19) : MISSING);
  const seconds = (s) => (s === null || s === undefined ? MISSING : Number(s).toFixed(1));
  const blank = (v) => (v === null || v === undefined ? "" : String(v));
  const who = (h) => `${blank(h.host)} / ${blank(h.pid)} / ${blank(h.thread)}`;
  const label = (name) => name.replaceAll("_", " ");

  // -- building rows ---------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(name, value);
    }
    node.append(...children); // strings become text nodes
    return node;
  }
  const cell = (text, cls) => el("td", cls ? { class: cls } : null, String(text));

  function actionLink(action, params, label) {
    const href = `${actionUrl.replace("ACTION", action)}?${new URLSearchParams(params)}`;
    return el("a", { class: "button", "data-action": action, href: href }, label);
  }

  function fill(id, rows, columns, emptyText) {
    const empty = el("tr", null, el("td", { colspan: columns, class: "sl-muted" }, emptyText));
    document.querySelector(`#${id} tbody`).replaceChildren(...(rows.length ? rows : [empty]));
  }

  function lockRow(lock) {
    const row = el(
      "tr",
      { "data-lock": lock.name },
      cell(lock.name),
      cell(who(lock)),
      cell(blank(lock.caller), "sl-wrap"),
      el("td", null, el("code", null, `${lock.token}\u2026`)),
      cell(blank(lock.fence), "num"),
      cell(lock.count, "num"),
      cell(when(lock.acquired_at)),
      cell(seconds(lock.lease_remaining), "num sl-lease"),
      cell(lock.watchdog ? "on" : "off"),
    );
    if (actionUrl) {
      row.append(el("td", null, actionLink("release_lock", { name: lock.name }, "Force release")));
    }
    return row;
  }

  function pager(locks, snapshot) {
    const span = document.getElementById("sl-lock-pages");
    const pages = Math.max(1, Math.ceil(locks.total / locks.page_size));
    const page = locks.page;
    if (pages === 1 && page === 1) {
      span.replaceChildren();
      return;
    }
    const query = (number) => {
      // As the server's _Query.link: q when given, the page, window and order when
      // they are not the defaults.
      const params = new URLSearchParams(search ? { q: search } : {});
      params.set("page", number);
      const windowLabel = WINDOWS[snapshot.summary.window];
      if (windowLabel && windowLabel !== "5m") params.set("window", windowLabel);
      if (snapshot.stock.order !== "drift") params.set("order", snapshot.stock.order);
      return `?${params}`;
    };
    span.replaceChildren(`page ${page} of ${pages} `);
    if (page > 1) {
      const previous = query(Math.min(page - 1, pages));
      span.append(el("a", { href: previous, rel: "prev" }, "\u2039 previous"), " ");
    }
    if (page < pages) span.append(el("a", { href: query(page + 1), rel: "next" }, "next \u203a"));
  }

  function semaphoreRows(semaphores) {
    const rows = [];
    for (const sem of semaphores) {
      for (const holder of sem.holders) {
        const row = el(
          "tr",
          { "data-semaphore": sem.name },
          cell(sem.name),
          cell(blank(sem.limit), "num"),
          cell(who(holder)),
          cell(blank(holder.caller), "sl-wrap"),
          cell(when(holder.acquired_at)),
          cell(seconds(holder.remaining), "num sl-lease"),
        );
        if (actionUrl) {
          const params = { name: sem.name, holder: holder.identifier };
          row.append(el("td", null, actionLink("evict_holder", params, "Evict")));
        }
        rows.push(row);
      }
    }
    return rows;
  }

  function queueRow(queue) {
    return el(
      "tr",
      { "data-queue": queue.name },
      cell(queue.name),
      cell(queue.due_now, "num"),
      cell(queue.scheduled, "num"),
      cell(queue.in_flight, "num"),
      cell(queue.dead, "num"),
      cell(when(queue.next_due)),
    );
  }

  function roomRow(room) {
    const row = el(
      "tr",
      { "data-room": room.slug },
      cell(`${room.name} (${room.slug})`),
      cell(room.state),
      cell(room.waiting, "num"),
      cell(room.prequeued, "num"),
      cell(`${room.admitted} / ${room.max_active}`, "num"),
      cell(Number(room.admitted_per_second).toFixed(1), "num"),
      cell(room.admitted_total, "num"),
      cell(room.abandoned, "num"),
      cell(room.left, "num"),
    );
    if (actionUrl) {
      row.append(el("td", null, actionLink("clear_room", { event: room.slug }, "Clear")));
    }
    return row;
  }

  function deadLetterRows(queues) {
    const rows = [];
    for (const queue of queues) {
      for (const letter of queue.dead_letters) {
        const row = el(
          "tr",
          { "data-dead": letter.id },
          cell(queue.name),
          cell(letter.id, "sl-wrap"),
          cell(blank(letter.task)),
          cell(letter.attempts, "num"),
          cell(blank(letter.error), "sl-error"),
          cell(when(letter.died_at)),
        );
        if (actionUrl) {
          const params = { queue: queue.name, id: letter.id };
          row.append(
            el(
              "td",
              null,
              actionLink("requeue", params, "Requeue"),
              " ",
              actionLink("discard", params, "Discard"),
            ),
          );
        }
        rows.push(row);
      }
    }
    return rows;
  }

  function stockRow(row) {
    const bar = el("progress", { max: row.of, value: row.sold + row.reserved });
    return el(
      "tr",
      { "data-sku": row.sku, class: row.drift ? "sl-drift" : null },
      cell(row.sku),
      el("td", { class: "sl-progress" }, bar,
        ` ${row.sold} of ${row.of} sold, ${row.reserved} reserved`),
      cell(row.db, "num"),
      cell(row.redis === null || row.redis === undefined ? "-" : row.redis, "num"),
      cell(row.reserved, "num"),
      cell(row.in_flight, "num"),
      cell(row.settled ? row.drift : "moving", "num"),
      cell(row.capped, "num"),
    );
  }

  // List items with a space between them, as the template's line breaks give.
  const spaced = (items) => items.flatMap((item, i) => (i ? [" ", item] : [item]));

  function text(id, value) {
    document.getElementById(id).textContent = String(value);
  }

  function renderSummary(sum, processes) {
    text("sl-sum-units-rate", Number(sum.units_per_second).toFixed(1));
    text("sl-sum-units", sum.units);
    text("sl-sum-paid", sum.paid);
    text("sl-sum-refused-rate", Number(sum.refused_per_second).toFixed(1));
    text("sl-sum-refused", sum.refused);
    document.getElementById("sl-sum-errors").replaceChildren(
      ...spaced(
        Object.entries(sum.errors).map(([kind, count]) =>
          el("li", count ? { class: "sl-error" } : null, `${label(kind)} `, el("b", null, String(count))),
        ),
      ),
    );
    text("sl-sum-locks", sum.held_locks);
    text("sl-sum-permits", `${sum.semaphores.held} of ${sum.semaphores.limit}`);
    text("sl-sum-waiting", sum.semaphores.waiting);
    text("sl-sum-due", sum.delay.due);
    const oldest = sum.delay.oldest_due_age;
    text("sl-sum-oldest", oldest === null ? "none" : `${seconds(oldest)} s`);
    text("sl-sum-dead", sum.delay.dead);
    text("sl-sum-drifting", sum.drifting);
    document.getElementById("sl-sum-drift-card").classList.toggle("sl-alarm", sum.drifting > 0);
    const items = processes.map((p) =>
      el(
        "li",
        { class: p.alive ? "sl-alive" : "sl-silent", "data-process": `${p.role}|${p.host}|${p.pid}` },
        `${p.role} ${p.host}/${p.pid} `,
        el("b", null, `${seconds(p.age)} s`),
      ),
    );
    const none = el("li", { class: "sl-silent" }, "no process has reported yet");
    document.getElementById("sl-processes").replaceChildren(...spaced(items.length ? items : [none]));
  }

  function render(snapshot) {
    renderSummary(snapshot.summary, snapshot.processes);
    for (const chart of snapshot.charts) {
      // Markup drawn by the server (stock_locks/charts.py), every label escaped there.
      const box = document.querySelector(`#sl-chart-${chart.id} .sl-chart-box`);
      if (box) box.innerHTML = chart.svg;
    }
    const locks = snapshot.locks;
    document.getElementById("sl-lock-total").textContent = String(locks.total);
    const noLock = search ? "No held lock matches the search." : "No lock is held.";
    fill("sl-locks", locks.rows.map(lockRow), 9 + actionColumn, noLock);
    pager(locks, snapshot);
    fill("sl-semaphores", semaphoreRows(snapshot.semaphores), 6 + actionColumn,
      "No semaphore permit is held.");
    fill("sl-queues", snapshot.delay_queues.map(queueRow), 6, "No delay queue.");
    fill("sl-dead", deadLetterRows(snapshot.delay_queues), 6 + actionColumn, "No dead letters.");
    if (document.getElementById("sl-rooms")) {
      fill("sl-rooms", snapshot.waiting_rooms.map(roomRow), 9 + actionColumn,
        "No waiting-room event.");
    }
    const stock = snapshot.stock;
    document.getElementById("sl-drifting").textContent = String(stock.drifting);
    fill("sl-stock", stock.rows.map(stockRow), 8,
      stock.configured ? "No SKU." : "STOCK_LOCKS['STOCK_MODEL'] is not set.");
    const updated = document.getElementById("sl-updated");
    updated.dateTime = snapshot.generated_at;
    updated.textContent = clock(snapshot.generated_at);
  }

  // -- refreshing --------------------------------------------------------------------
  async function refresh() {
    const error = document.getElementById("sl-error");
    if (!document.hidden) {
      try {
        const response = await fetch(root.dataset.jsonUrl + window.location.search, {
          headers: { Accept: "application/json" },
          credentials: "same-origin",
        });
        if (response.redirected) throw new Error("signed out? reload the page");
        if (!response.ok) {
          const detail = await response.json().then((body) => body.error, () => "");
          throw new Error(`HTTP ${response.status}${detail ? `: ${detail}` : ""}`);
        }
        render(await response.json());
        error.textContent = "";
        root.dataset.refreshes = String(++refreshes);
      } catch (failure) {
        error.textContent = `(refresh failed: ${failure.message})`;
      }
    }
    window.setTimeout(refresh, period); // after the answer: refreshes never pile up
  }

  window.setTimeout(refresh, period);
})();
