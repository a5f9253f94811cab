// Portcullis key console, teams: the signed-in owner's team (GET /v1/owners/{sub}/team) and
// that team's budget with what is left (GET /v1/teams/{team}/budget); for an administrator,
// the team of the owner looked up in the budget panel, set or cleared (PUT
// /v1/owners/{sub}/team), and any team's budget, looked up and set or cleared (PUT
// /v1/teams/{team}/budget). A team's budget covers all its owners' keys and signed-in calls,
// on top of their own budgets. Loaded after budgets.js, whose drawing and fields it uses, and
// before console.js, which creates the view with its `api` function: the token stays there.
// Team names and owners are user text: they go into the page with textContent or value only.
'use strict';

window.PortcullisTeams = (() => {
  const $ = (id) => document.getElementById(id);
  const memberPath = (sub) => `/v1/owners/${encodeURIComponent(sub)}/team`;
  const budgetPath = (team) => `/v1/teams/${encodeURIComponent(team)}/budget`;
  const readAt = () => `${new Date().toISOString().slice(11, 16)} UTC`;
  const teamOf = (answer) => (answer && typeof answer.team === 'string' ? answer.team : null);

  // `api(method, path, body)` and `describe(err)` are console.js's; `viewer()` gives
  // { signedIn, sub, admin }; `currency` is the gateway's (config.json).
  function create({ api, describe, viewer, currency }) {
    const { drawSubject, fields, read } = window.PortcullisBudgets;
    let generation = 0; // the own team's read: one answered after a sign-out or a newer read is dropped
    let lookups = 0; // likewise for the administrator's lookup of an owner's team
    let member = null; // the owner whose team the administrator edits
    let looked = null; // the team whose budget the administrator looked up
    let ownTeam = null; // the signed-in owner's team, as last read

    function status(id, text, kind = 'info') {
      $(id).dataset.kind = kind;
      $(id).textContent = text;
    }

    // ---- the signed-in owner's team ----

    // "You are in team X." with the name as text, or that it is in none.
    function ownTeamLine(team) {
      const p = $('own-team-line');
      if (!team) {
        p.textContent = 'You are in no team.';
        return;
      }
      const name = document.createElement('strong');
      name.dataset.testid = 'own-team-name';
      name.textContent = team;
      p.replaceChildren('You are in team ', name, '. Its budget covers all its owners\' keys and signed-in calls together.');
    }

    async function load() {
      const mine = ++generation;
      const { sub, admin } = viewer();
      $('team-admin').hidden = !admin;
      $('own-team').hidden = !sub;
      if (!sub) return;
      status('team-status', 'Loading your team…');
      try {
        const team = teamOf(await api('GET', memberPath(sub)));
        const data = team ? await api('GET', budgetPath(team)) : null;
        if (mine !== generation) return;
        ownTeam = team;
        ownTeamLine(team);
        if (team) drawSubject($('own-team-budget'), data, { kind: 'team', context: `Team ${team}`, currency });
        else $('own-team-budget').replaceChildren();
        status('team-status', team ? `Team budget read at ${readAt()}.` : '');
      } catch (err) {
        if (mine !== generation || !viewer().signedIn) return;
        $('own-team-line').textContent = '';
        $('own-team-budget').replaceChildren();
        status('team-status', `Could not load your team: ${describe(err)}`, 'error');
      }
    }

    function clear() {
      generation += 1;
      lookups += 1;
      member = null;
      looked = null;
      ownTeam = null;
      $('own-team-line').textContent = '';
      $('own-team-budget').replaceChildren();
      $('owner-team-form').hidden = true;
      $('team-result').hidden = true;
      $('team-admin').hidden = true;
      $('team-lookup').reset();
      for (const id of ['team-status', 'owner-team-status', 'team-admin-status']) status(id, '');
    }

    // ---- an owner's team, for an administrator (beside the owner's budget) ----

    function showMember(sub, team) {
      member = sub;
      $('owner-team-current').textContent = team ? `${sub} is in team ${team}.` : `${sub} is in no team.`;
      $('owner-team').value = team || '';
      $('owner-team-form').hidden = false;
    }

    // On the budget panel's owner lookup, which budgets.js answers with the owner's budget.
    async function lookUpMember() {
      const mine = ++lookups;
      const sub = $('owner-sub').value.trim();
      member = null;
      $('owner-team-form').hidden = true;
      status('owner-team-status', '');
      if (!sub) return; // budgets.js says what is missing
      try {
        const team = teamOf(await api('GET', memberPath(sub)));
        if (mine === lookups) showMember(sub, team);
      } catch (err) {
        if (mine === lookups && viewer().signedIn) {
          status('owner-team-status', `Could not read the team of ${sub}: ${describe(err)}`, 'error');
        }
      }
    }

    async function putMember(team) {
      const sub = member;
      const buttons = [$('owner-team-save'), $('owner-team-clear')];
      for (const b of buttons) b.disabled = true;
      try {
        const now = teamOf(await api('PUT', memberPath(sub), { team }));
        showMember(sub, now);
        status('owner-team-status', now ? `${sub} is now in team ${now}.` : `${sub} is in no team now.`, 'ok');
        if (now && !$('team-name').value.trim()) $('team-name').value = now; // ready to look its budget up
        if (sub === viewer().sub) load();
      } catch (err) {
        if (viewer().signedIn) status('owner-team-status', `Could not ${team ? 'set' : 'clear'} the team of ${sub}: ${describe(err)}`, 'error');
      } finally {
        for (const b of buttons) b.disabled = false;
      }
    }

    function saveMember(event) {
      event.preventDefault();
      const team = $('owner-team').value.trim();
      if (!team) {
        status('owner-team-status', 'Enter a team, or remove the owner from its team.', 'error');
        $('owner-team').focus();
        return;
      }
      putMember(team);
    }

    // ---- any team's budget, for an administrator ----

    function showTeam(team, data) {
      looked = team;
      $('team-result-title').textContent = `Budget of team ${team}`;
      drawSubject($('team-result-view'), data, { kind: 'team', context: `Budget of team ${team}`, currency });
      fields($('team-budget-fields'), 'team-budget', data && data.budget, currency);
      $('team-result').hidden = false;
    }

    async function lookUpTeam(event) {
      event.preventDefault();
      const team = $('team-name').value.trim();
      if (!team) {
        status('team-admin-status', 'Enter a team: the name an owner was put in.', 'error');
        $('team-name').focus();
        return;
      }
      status('team-admin-status', `Loading the budget of team ${team}…`);
      try {
        showTeam(team, await api('GET', budgetPath(team)));
        status('team-admin-status', `Budget of team ${team} read at ${readAt()}.`);
      } catch (err) {
        $('team-result').hidden = true;
        if (viewer().signedIn) status('team-admin-status', `Could not read the budget of team ${team}: ${describe(err)}`, 'error');
      }
    }

    async function putTeam(budget) {
      const team = looked;
      const buttons = [$('team-save'), $('team-clear')];
      for (const b of buttons) b.disabled = true;
      try {
        showTeam(team, await api('PUT', budgetPath(team), { budget }));
        status('team-admin-status', budget ? `Budget of team ${team} saved.` : `Budget of team ${team} cleared: no team budget.`, 'ok');
        if (team === ownTeam) load();
      } catch (err) {
        if (viewer().signedIn) status('team-admin-status', `Could not ${budget ? 'save' : 'clear'} the budget of team ${team}: ${describe(err)}`, 'error');
      } finally {
        for (const b of buttons) b.disabled = false;
      }
    }

    function saveTeam(event) {
      event.preventDefault();
      const got = read($('team-budget-fields'));
      if (got.error) {
        status('team-admin-status', got.error, 'error');
        got.input.focus();
        return;
      }
      putTeam(got.value);
    }

    $('owner-lookup').addEventListener('submit', lookUpMember);
    $('owner-team-form').addEventListener('submit', saveMember);
    $('owner-team-clear').addEventListener('click', () => putMember(null));
    $('team-lookup').addEventListener('submit', lookUpTeam);
    $('team-budget-form').addEventListener('submit', saveTeam);
    $('team-clear').addEventListener('click', () => putTeam(null));
    $('refresh-budget').addEventListener('click', load);

    return { load, clear };
  }

  return Object.freeze({ create });
})();
